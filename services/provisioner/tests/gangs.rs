//! Gangs through the provisioner's cycle on the simulated cloud: one launch of all the nodes
//! it needs, in one zone and the pool's placement group, or none.

use crate::support;

use kiln_cloud::{LaunchIntent, PoolSpec, Unavailable};
use kiln_core::ids::now_ms;
use kiln_core::provisioning::{Demand, DemandJob};
use kiln_core::store::cloud::intent_state;
use kiln_provisioner::release::Seen;
use support::{CLUSTER, Rig, demand, job, pool, spot};

#[tokio::test]
async fn a_gang_is_one_launch_of_all_its_nodes_in_one_zone_and_its_placement_group() {
    let rig = Rig::new().await;
    let mut leader = rig.leader_of(PoolSpec {
        placement_group: Some("kiln-runner-cpu".into()),
        ..pool()
    });
    let gang = DemandJob {
        nodes: 3,
        ..job("gang", 2, "auto")
    };
    let wanted = demand(vec![gang, job("alone", 2, "auto")]);
    let first = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!((first.calls, first.launched), (2, 4));
    let intents = rig.store.intents(CLUSTER, &[intent_state::LAUNCHED]).await.unwrap();
    let sent: Vec<LaunchIntent> = intents
        .iter()
        .map(|record| serde_json::from_str(&record.request).unwrap())
        .collect();
    let gang_intent = sent
        .iter()
        .find(|i| i.count == 3)
        .expect("one intent for the gang's three machines");
    assert_eq!((gang_intent.min_count, gang_intent.single_zone), (3, true));
    assert_eq!(gang_intent.placement_group.as_deref(), Some("kiln-runner-cpu"));
    let other = sent.iter().find(|i| i.count == 1).expect("the other job's intent");
    assert_eq!((other.single_zone, other.placement_group.as_deref()), (false, None));
    let gang_instances: Vec<_> = rig
        .live()
        .await
        .into_iter()
        .filter(|i| i.intent_id == gang_intent.id.to_string())
        .collect();
    assert_eq!(gang_instances.len(), 3);
    assert!(
        gang_instances.iter().all(|i| i.zone == gang_instances[0].zone),
        "{gang_instances:?}"
    );
    // The same demand again: the gang's nodes ride the machines on their way.
    let second = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!((second.calls, second.launched), (0, 0));
}

#[tokio::test]
async fn a_gang_no_zone_holds_whole_launches_nothing_and_is_tried_again() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    // Spot capacity for two machines per zone: the zones together could hold the gang of
    // three, none whole.
    for zone in ["sim-a", "sim-b", "sim-c"] {
        rig.sim.set_capacity(&spot("c.large", zone), Some(2));
        for instance_type in ["c.xlarge", "m.2xlarge"] {
            rig.sim
                .set_unavailable(&spot(instance_type, zone), Some(Unavailable::NoCapacity));
        }
    }
    let gang = DemandJob {
        nodes: 3,
        ..job("gang", 2, "spot")
    };
    let wanted = demand(vec![gang]);
    let now = now_ms();
    let cycle = leader.cycle(&wanted, &Seen::default(), now).await.unwrap();
    assert_eq!(cycle.launched, 0);
    assert_eq!(rig.sim.live_instances(), 0, "never a partial gang");
    // Once a zone holds it whole, the whole gang is launched there.
    rig.sim.set_capacity(&spot("c.large", "sim-b"), Some(3));
    let later = now + 181_000;
    let cycle = leader
        .cycle(&Demand { at_ms: later, ..wanted }, &Seen::default(), later)
        .await
        .unwrap();
    assert_eq!(cycle.launched, 3);
    let zones: Vec<String> = rig.live().await.into_iter().map(|i| i.zone).collect();
    assert_eq!(zones, ["sim-b", "sim-b", "sim-b"]);
}
