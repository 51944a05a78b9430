use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;

use super::*;
use crate::{InstanceState, IntentId, Requirements, Shape, TemplateRef};

fn key(instance_type: &str, zone: &str) -> OfferingKey {
    OfferingKey {
        instance_type: instance_type.into(),
        zone: zone.into(),
        capacity: CapacityType::Spot,
    }
}

fn candidate(instance_type: &str, zone: &str) -> Offering {
    Offering {
        key: key(instance_type, zone),
        shape: Shape::default(),
        price_per_hour: 0.03,
        price_source: PriceSource::Configured,
        subnet: None,
    }
}

fn intent(count: u32, candidates: Vec<Offering>) -> LaunchIntent {
    LaunchIntent {
        id: IntentId::new(),
        cluster: "c1".into(),
        pool: "cpu".into(),
        capacity: CapacityType::Spot,
        count,
        min_count: 0,
        single_zone: false,
        placement_group: None,
        candidates,
        template: TemplateRef {
            name: "sim".into(),
            version: None,
        },
        labels: BTreeMap::new(),
        root_volume: None,
    }
}

fn sim() -> SimCloud {
    SimCloud::new(
        SimCatalogue::standard(),
        SimConfig {
            boot_min: Duration::from_secs(10),
            boot_max: Duration::from_secs(20),
            notice: Duration::from_secs(120),
            ..SimConfig::default()
        },
    )
}

fn selector(intent: Option<IntentId>) -> TagSelector {
    TagSelector {
        cluster: "c1".into(),
        pool: None,
        intent,
        live_only: false,
    }
}

#[tokio::test]
async fn launches_on_the_first_candidate_and_boots_after_the_latency() {
    let cloud = sim();
    let wanted = intent(3, vec![candidate("c.large", "sim-a"), candidate("c.xlarge", "sim-b")]);
    let launched = cloud.create(&wanted).await.expect("create");
    assert_eq!(launched.instances.len(), 3);
    assert!(launched.failures.is_empty());
    assert!(launched.instances.iter().all(|i| i.key == key("c.large", "sim-a")));
    assert!(launched.instances.iter().all(|i| i.state == InstanceState::Pending));
    assert!(
        launched
            .instances
            .iter()
            .all(|i| i.intent == Some(wanted.id) && i.pool.as_deref() == Some("cpu"))
    );

    cloud.advance(Duration::from_secs(9));
    let listed = cloud.list(&selector(Some(wanted.id))).await.expect("list");
    assert!(
        listed.iter().all(|i| i.state == InstanceState::Pending),
        "before the shortest boot"
    );
    cloud.advance(Duration::from_secs(11));
    let listed = cloud.list(&selector(Some(wanted.id))).await.expect("list");
    assert!(
        listed.iter().all(|i| i.state == InstanceState::Running),
        "after the longest boot"
    );
}

#[tokio::test]
async fn the_same_intent_again_gets_the_same_instances() {
    let cloud = sim();
    let wanted = intent(2, vec![candidate("c.large", "sim-a")]);
    let first = cloud.create(&wanted).await.expect("create");
    let again = cloud.create(&wanted).await.expect("create again");
    let ids = |l: &Launched| l.instances.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), ids(&again));
    assert_eq!(cloud.live_instances(), 2);
    assert_eq!(cloud.calls().create, 2);
}

#[tokio::test]
async fn a_capacity_cap_spills_onto_the_next_candidate() {
    let cloud = sim();
    cloud.set_capacity(&key("c.large", "sim-a"), Some(1));
    let launched = cloud
        .create(&intent(
            3,
            vec![candidate("c.large", "sim-a"), candidate("c.xlarge", "sim-a")],
        ))
        .await
        .expect("create");
    let on = |k: OfferingKey| launched.instances.iter().filter(|i| i.key == k).count();
    assert_eq!(on(key("c.large", "sim-a")), 1);
    assert_eq!(on(key("c.xlarge", "sim-a")), 2);
    assert_eq!(launched.failures.len(), 1);
    assert_eq!(launched.failures[0].key, key("c.large", "sim-a"));
    assert_eq!(launched.failures[0].reason, Unavailable::NoCapacity);

    // The cap counts live instances: ending one makes room again.
    cloud
        .terminate(&[launched.instances[0].id.clone()])
        .await
        .expect("terminate");
    let more = cloud
        .create(&intent(1, vec![candidate("c.large", "sim-a")]))
        .await
        .expect("create");
    assert_eq!(more.instances.len(), 1);
}

#[tokio::test]
async fn injected_reasons_minimums_and_unoffered_pairs_fail_offerings() {
    let cloud = SimCloud::new(
        SimCatalogue {
            not_offered: vec![("g.xlarge".into(), "sim-c".into())],
            ..SimCatalogue::standard()
        },
        SimConfig::default(),
    );
    let quota = Unavailable::Quota {
        name: "spot vCPU".into(),
    };
    cloud.set_unavailable(&key("c.large", "sim-a"), Some(quota.clone()));
    cloud.set_capacity(&key("c.xlarge", "sim-a"), Some(2));
    let mut gang = intent(
        3,
        vec![
            candidate("c.large", "sim-a"),
            candidate("c.xlarge", "sim-a"),
            candidate("g.xlarge", "sim-c"),
        ],
    );
    gang.min_count = 3;
    let launched = cloud.create(&gang).await.expect("create");
    assert!(launched.instances.is_empty(), "2 of 3 is below the minimum: nothing");
    let reasons: Vec<Unavailable> = launched.failures.iter().map(|f| f.reason.clone()).collect();
    assert_eq!(reasons, [quota, Unavailable::NoCapacity, Unavailable::NotOffered]);
    assert_eq!(cloud.live_instances(), 0);

    cloud.set_unavailable(&key("c.large", "sim-a"), None);
    let launched = cloud
        .create(&intent(1, vec![candidate("c.large", "sim-a")]))
        .await
        .expect("create");
    assert_eq!(launched.instances.len(), 1);
}

#[tokio::test]
async fn a_single_zone_gang_lands_in_the_zone_that_holds_it() {
    let cloud = sim();
    cloud.set_capacity(&key("c.large", "sim-a"), Some(2));
    let mut gang = intent(4, vec![candidate("c.large", "sim-a"), candidate("c.large", "sim-b")]);
    gang.single_zone = true;
    gang.min_count = 4;
    let launched = cloud.create(&gang).await.expect("create");
    assert_eq!(launched.instances.len(), 4);
    assert!(launched.instances.iter().all(|i| i.key.zone == "sim-b"));
}

#[tokio::test]
async fn lists_by_tags_and_terminates_idempotently() {
    let cloud = sim();
    let cpu = intent(2, vec![candidate("c.large", "sim-a")]);
    let mut gpu = intent(1, vec![candidate("g.xlarge", "sim-b")]);
    gpu.pool = "gpu".into();
    let mut other = intent(1, vec![candidate("c.large", "sim-a")]);
    other.cluster = "c2".into();
    for wanted in [&cpu, &gpu, &other] {
        cloud.create(wanted).await.expect("create");
    }
    assert_eq!(cloud.list(&selector(None)).await.expect("list").len(), 3);
    let gpu_pool = TagSelector {
        pool: Some("gpu".into()),
        ..selector(None)
    };
    assert_eq!(cloud.list(&gpu_pool).await.expect("list").len(), 1);
    let mine = cloud.list(&selector(Some(cpu.id))).await.expect("list");
    assert_eq!(mine.len(), 2);
    assert!(
        cloud
            .list(&selector(Some(IntentId::new())))
            .await
            .expect("list")
            .is_empty()
    );

    let mut ids: Vec<InstanceId> = mine.iter().map(|i| i.id.clone()).collect();
    ids.push(InstanceId("sim-i-unknown".into()));
    cloud.terminate(&ids).await.expect("terminate");
    cloud.terminate(&ids).await.expect("terminate again");
    let live = TagSelector {
        live_only: true,
        ..selector(None)
    };
    assert_eq!(cloud.list(&live).await.expect("list").len(), 1);
    let ended = cloud.get(&ids[0]).await.expect("get").expect("still known");
    assert_eq!(ended.state, InstanceState::Terminated);
    assert_eq!(cloud.get(&InstanceId("nope".into())).await.expect("get"), None);
}

#[tokio::test]
async fn notices_rebalances_and_ends_reach_the_stream() {
    let cloud = sim();
    let mut events = cloud.interruptions().expect("the sim has a stream");
    let launched = cloud
        .create(&intent(2, vec![candidate("c.large", "sim-a")]))
        .await
        .expect("create");
    let (first, second) = (launched.instances[0].id.clone(), launched.instances[1].id.clone());

    assert!(cloud.rebalance(&first));
    assert!(matches!(events.next().await, Some(Interruption::Rebalance { instance, .. }) if instance == first));
    assert!(cloud.preempt(&first));
    assert!(matches!(
        events.next().await,
        Some(Interruption::Notice { instance, action: NoticeAction::Terminate, .. }) if instance == first
    ));
    assert!(!cloud.preempt(&first), "one notice per instance");
    assert!(
        cloud.get(&first).await.expect("get").expect("known").state.is_live(),
        "alive during the notice"
    );
    cloud.advance(Duration::from_secs(121));
    assert!(matches!(events.next().await, Some(Interruption::Gone { instance }) if instance == first));
    assert_eq!(
        cloud.get(&first).await.expect("get").expect("known").state,
        InstanceState::Terminated
    );

    cloud.terminate(std::slice::from_ref(&second)).await.expect("terminate");
    assert!(matches!(events.next().await, Some(Interruption::Gone { instance }) if instance == second));
    assert!(!cloud.rebalance(&second), "no recommendation for an ended instance");
}

#[tokio::test]
async fn faults_fail_or_drop_calls() {
    let cloud = sim();
    cloud.fail_next(
        SimMethod::Create,
        SimFault::Error(CloudError::Throttled { retry_after: None }),
        1,
    );
    let wanted = intent(1, vec![candidate("c.large", "sim-a")]);
    assert!(matches!(cloud.create(&wanted).await, Err(CloudError::Throttled { .. })));
    assert_eq!(cloud.live_instances(), 0, "a failed call does nothing");

    cloud.fail_next(SimMethod::Create, SimFault::Drop, 1);
    assert!(matches!(cloud.create(&wanted).await, Err(CloudError::Ambiguous(_))));
    let found = cloud.list(&selector(Some(wanted.id))).await.expect("list");
    assert_eq!(found.len(), 1, "a dropped answer's launch happened");
    let again = cloud.create(&wanted).await.expect("create again");
    assert_eq!(again.instances[0].id, found[0].id);
    assert_eq!(
        cloud.calls(),
        SimCalls {
            create: 3,
            list: 1,
            ..SimCalls::default()
        }
    );
}

#[tokio::test]
async fn offerings_follow_the_pool_and_the_prices() {
    let cloud = sim();
    cloud.set_spot_price("c.large", "sim-a", 0.025);
    let mut pool = PoolSpec {
        name: "cpu".into(),
        cloud: "sim".into(),
        region: String::new(),
        subnets: Vec::new(),
        zones: vec!["sim-a".into(), "sim-x".into()],
        instance_types: Vec::new(),
        requirements: Some(Requirements {
            vcpu: Some([2, 4]),
            gpus: Some([0, 0]),
            ..Requirements::default()
        }),
        capacity_types: vec![CapacityType::Spot, CapacityType::OnDemand],
        launch_template: String::new(),
        launch_template_version: None,
        max_instances: 10,
        idle_timeout_secs: 300,
        boot_timeout_secs: 600,
        labels: BTreeMap::new(),
        disk: Default::default(),
        on_demand_prices: BTreeMap::from([("c.xlarge".to_owned(), 0.15)]),
        placement_group: None,
    };
    let offerings = cloud.offerings(&pool).await.expect("offerings");
    let priced: Vec<(String, CapacityType, f64)> = offerings
        .iter()
        .map(|o| (o.key.instance_type.clone(), o.key.capacity, o.price_per_hour))
        .collect();
    assert_eq!(
        priced,
        [
            ("c.large".to_owned(), CapacityType::Spot, 0.025),
            ("c.large".to_owned(), CapacityType::OnDemand, 0.085),
            ("c.xlarge".to_owned(), CapacityType::Spot, 0.06),
            ("c.xlarge".to_owned(), CapacityType::OnDemand, 0.15),
        ]
    );
    assert!(matches!(offerings[0].price_source, PriceSource::SpotHistory { .. }));
    assert!(offerings.iter().all(|o| o.key.zone == "sim-a" && o.subnet.is_none()));

    pool.requirements = None;
    pool.instance_types = vec!["g.xlarge".into()];
    pool.zones = Vec::new();
    assert_eq!(
        cloud.offerings(&pool).await.expect("offerings").len(),
        6,
        "3 zones × 2 capacity types"
    );
}

#[tokio::test]
async fn seeded_boots_repeat() {
    let boots = |seed: u64| async move {
        let cloud = SimCloud::new(
            SimCatalogue::standard(),
            SimConfig {
                seed,
                boot_min: Duration::from_secs(1),
                boot_max: Duration::from_secs(100),
                ..SimConfig::default()
            },
        );
        let wanted = intent(50, vec![candidate("c.large", "sim-a")]);
        cloud.create(&wanted).await.expect("create");
        cloud.advance(Duration::from_secs(50));
        let listed = cloud.list(&selector(Some(wanted.id))).await.expect("list");
        listed
            .iter()
            .map(|i| i.state == InstanceState::Running)
            .collect::<Vec<bool>>()
    };
    let first = boots(7).await;
    assert_eq!(first, boots(7).await);
    assert!(
        first.contains(&true) && first.contains(&false),
        "latencies spread over the range"
    );
}

#[tokio::test]
async fn thousands_of_instances_stay_cheap() {
    let cloud = sim();
    let started = Instant::now();
    let mut intents = Vec::new();
    for index in 0..1000 {
        let zone = ["sim-a", "sim-b", "sim-c"][index % 3];
        let wanted = intent(1, vec![candidate("c.large", zone)]);
        cloud.create(&wanted).await.expect("create");
        intents.push(wanted.id);
    }
    cloud
        .create(&intent(1000, vec![candidate("c.xlarge", "sim-a")]))
        .await
        .expect("create");
    for id in &intents {
        assert_eq!(cloud.list(&selector(Some(*id))).await.expect("list").len(), 1);
    }
    let all = cloud.list(&selector(None)).await.expect("list");
    assert_eq!(all.len(), 2000);
    let ids: Vec<InstanceId> = all.iter().map(|i| i.id.clone()).collect();
    cloud.terminate(&ids).await.expect("terminate");
    assert_eq!(cloud.live_instances(), 0);
    // Debug build on a shared 2-core machine: generous, but quadratic work would blow it.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn two_clouds_never_make_the_same_instance_id() {
    // A provisioner restarted over the same store gets a new simulated cloud: its instances must
    // not take the ids of the records the last one left (the store keeps ids once).
    let mut ids = std::collections::HashSet::new();
    for _ in 0..2 {
        let cloud = sim();
        let launched = cloud
            .create(&intent(3, vec![candidate("c.large", "sim-a")]))
            .await
            .unwrap();
        assert_eq!(launched.instances.len(), 3);
        ids.extend(launched.instances.into_iter().map(|i| i.id));
    }
    assert_eq!(ids.len(), 6);
}

#[tokio::test]
async fn the_bill_runs_from_launch_to_termination_at_the_launch_price() {
    let cloud = sim();
    let mut dear = candidate("c.xlarge", "sim-a");
    dear.price_per_hour = 0.06;
    let cheap = cloud
        .create(&intent(1, vec![candidate("c.large", "sim-a")]))
        .await
        .unwrap();
    cloud.create(&intent(1, vec![dear])).await.unwrap();
    cloud.advance(Duration::from_secs(3600));
    cloud.terminate(&[cheap.instances[0].id.clone()]).await.unwrap();
    cloud.advance(Duration::from_secs(3600));
    let bill = cloud.bill();
    assert_eq!(bill.instances, 2);
    // One hour of the cheap one, two of the dear one (and the test's own few milliseconds).
    assert!((bill.instance_hours - 3.0).abs() < 0.001, "{bill:?}");
    assert!((bill.cost - (0.03 + 2.0 * 0.06)).abs() < 0.0001, "{bill:?}");
}
