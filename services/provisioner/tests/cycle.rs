//! The provisioner's cycle against the simulated cloud and a real store (SQLite): packing,
//! capacity errors, a lost answer across a leader change, the reaper, the boot timeout, and
//! scale to zero. The same code drives EC2 (tests/e2e: moto, the fault proxy and AEMM).

use crate::support;

use std::collections::{BTreeMap, HashMap};

use kiln_cloud::sim::{SimFault, SimMethod};
use kiln_cloud::{CapacityType, Cloud, IntentId, LaunchIntent, TagSelector, TemplateRef, Unavailable};
use kiln_core::ids::now_ms;
use kiln_core::provisioning::{Demand, DemandJob};
use kiln_core::store::cloud::{instance_state, intent_state};
use kiln_provisioner::release::Seen;
use support::{CLUSTER, Rig, demand, job, pool, spot};

#[tokio::test]
async fn forty_jobs_get_the_machines_their_packing_needs_once() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    let jobs: Vec<DemandJob> = (0..40)
        .map(|n| job(&format!("j{n:02}"), [1, 2, 4, 3][n % 4], "auto"))
        .collect();
    let wanted = demand(jobs);
    let first = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    let live = rig.live().await;
    assert_eq!(first.launched, live.len());
    assert_eq!(rig.sim.live_instances(), live.len());
    // The cheapest CPU is spot c.large and c.xlarge at 0.015 per CPU-hour: 100 CPUs cost at
    // least 1.5 an hour; the packing may not cost more than a tenth over that.
    let cost: f64 = live.iter().map(|i| i.price_per_hour).sum();
    assert!(cost <= 1.5 * 1.1 + 1e-9, "{cost} for {} machines", live.len());
    assert!(live.iter().all(|i| i.capacity == "spot"));
    // The same demand again: every job rides a machine on its way; nothing more is launched.
    let second = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!((second.calls, second.launched), (0, 0));
    assert_eq!(rig.sim.live_instances(), live.len());
    let status = &second.statuses[0];
    assert_eq!(status.live_instances as usize, live.len());
    let launching: usize = status.launching.iter().map(|l| l.jobs.len()).sum();
    assert_eq!(launching, 40, "every job is named by a launch on its way");
}

#[tokio::test]
async fn no_capacity_on_the_cheapest_offerings_launches_the_next_in_the_same_call() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    for zone in ["sim-a", "sim-b", "sim-c"] {
        rig.sim
            .set_unavailable(&spot("c.large", zone), Some(Unavailable::NoCapacity));
    }
    let now = now_ms();
    let cycle = leader
        .cycle(&demand(vec![job("a", 2, "spot")]), &Seen::default(), now)
        .await
        .unwrap();
    // The call names every offering that holds the job, cheapest first: the cloud goes on to the
    // next one (CreateFleet's overrides), and each that failed is marked.
    assert_eq!((cycle.calls, cycle.launched), (1, 1));
    let live = rig.live().await;
    assert_eq!(live[0].instance_type, "c.xlarge");
    let status = &cycle.statuses[0];
    assert_eq!(status.unavailable.len(), 3);
    assert_eq!(status.unavailable[0].reason, "no capacity");
    // After the offerings' unavailability expires, the cheap type is tried first again.
    for zone in ["sim-a", "sim-b", "sim-c"] {
        rig.sim.set_unavailable(&spot("c.large", zone), None);
    }
    let later = now + 181_000;
    let seen = Seen {
        runner_on: HashMap::from([(live[0].instance_id.clone(), "r-1".to_string())]),
        busy: ["r-1".to_string()].into(),
        ..Seen::default()
    };
    // The scheduler saw that runner busy after it registered: the new job is for a new machine.
    let after = Demand {
        at_ms: later + 1,
        jobs: vec![job("b", 2, "spot")],
    };
    let cycle = leader.cycle(&after, &seen, later).await.unwrap();
    assert_eq!((cycle.calls, cycle.launched), (1, 1));
    assert!(cycle.statuses[0].unavailable.is_empty());
    let types: Vec<String> = rig.live().await.into_iter().map(|i| i.instance_type).collect();
    assert_eq!(types, ["c.xlarge", "c.large"]);
}

#[tokio::test]
async fn a_quota_holds_spot_jobs_with_the_quota_named_and_calls_stay_bounded() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    let quota = Unavailable::Quota {
        name: "spot vCPU (standard family)".into(),
    };
    for zone in ["sim-a", "sim-b", "sim-c"] {
        for instance_type in ["c.large", "c.xlarge", "m.2xlarge"] {
            rig.sim.set_unavailable(&spot(instance_type, zone), Some(quota.clone()));
        }
    }
    let wanted = demand(vec![job("spot-only", 2, "spot"), job("auto", 2, "auto")]);
    let now = now_ms();
    let cycle = leader.cycle(&wanted, &Seen::default(), now).await.unwrap();
    // The spot call fails with the quota; every spot offering of the bucket is marked, so the
    // `auto` job falls back to on-demand in the same cycle and the spot-only job waits.
    assert_eq!(cycle.launched, 1);
    assert_eq!(rig.live().await[0].capacity, "on-demand");
    let held = &cycle.statuses[0].held_back;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].0, "spot-only");
    assert!(
        held[0].1.contains("spot vCPU (standard family) quota reached"),
        "{held:?}"
    );
    let creates = rig.sim.calls().create;
    for second in 1..=10 {
        leader
            .cycle(&wanted, &Seen::default(), now + second * 1000)
            .await
            .unwrap();
    }
    assert_eq!(rig.sim.calls().create, creates, "no call while the quota is marked");
}

#[tokio::test]
async fn a_lost_answer_is_adopted_by_the_next_leader_and_nothing_is_launched_twice() {
    let rig = Rig::new().await;
    let wanted = demand(vec![job("a", 2, "spot")]);
    let mut first = rig.leader();
    rig.sim.fail_next(SimMethod::Create, SimFault::Drop, 1);
    let cycle = first.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!((cycle.calls, cycle.launched), (1, 0));
    assert_eq!(rig.sim.live_instances(), 1, "the call took effect; its answer was lost");
    assert!(rig.live().await.is_empty());
    let calling = rig.store.intents(CLUSTER, &[intent_state::CALLING]).await.unwrap();
    assert_eq!(calling.len(), 1);
    // The leader dies before it could do more; a new one lists by the intent's tag and adopts.
    drop(first);
    let mut second = rig.leader();
    let cycle = second.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!(cycle.reconciled.adopted, 1);
    assert_eq!(cycle.launched, 0);
    assert_eq!(rig.sim.calls().create, 1);
    assert_eq!(rig.live().await.len(), 1);
    assert_eq!(rig.sim.live_instances(), 1);
    let launched = rig.store.intents(CLUSTER, &[intent_state::LAUNCHED]).await.unwrap();
    assert_eq!(launched[0].id, calling[0].id);
}

#[tokio::test]
async fn an_unknown_tagged_instance_is_reaped_and_an_unregistered_one_times_out() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    // An instance with this cluster's tag that kiln never recorded (an intent it never wrote).
    let stray = LaunchIntent {
        id: IntentId::new(),
        cluster: CLUSTER.into(),
        pool: "cpu".into(),
        capacity: CapacityType::OnDemand,
        count: 1,
        min_count: 1,
        single_zone: false,
        placement_group: None,
        candidates: rig
            .sim
            .offerings(&pool())
            .await
            .unwrap()
            .into_iter()
            .filter(|o| o.key.capacity == CapacityType::OnDemand)
            .take(1)
            .collect(),
        template: TemplateRef {
            name: "kiln-runner-cpu".into(),
            version: None,
        },
        labels: BTreeMap::new(),
        root_volume: None,
    };
    rig.sim.create(&stray).await.unwrap();
    // Another cluster's instance is never touched.
    let other = LaunchIntent {
        id: IntentId::new(),
        cluster: "someone-else".into(),
        ..stray.clone()
    };
    rig.sim.create(&other).await.unwrap();
    let now = now_ms();
    assert_eq!(leader.reap(now).await.unwrap().reaped, 0, "within the grace");
    let reaped = leader.reap(now + 121_000).await.unwrap();
    assert_eq!(reaped.reaped, 1);
    let left = rig
        .sim
        .list(&TagSelector {
            cluster: "someone-else".into(),
            live_only: true,
            ..TagSelector::default()
        })
        .await
        .unwrap();
    assert_eq!(left.len(), 1);
    // A launched instance whose runner never registers is terminated after the boot timeout.
    leader
        .cycle(&demand(vec![job("a", 2, "spot")]), &Seen::default(), now)
        .await
        .unwrap();
    assert_eq!(rig.live().await.len(), 1);
    let cycle = leader
        .cycle(&demand(vec![]), &Seen::default(), now + 600_001)
        .await
        .unwrap();
    assert_eq!(cycle.released.boot_timeouts, 1);
    assert!(rig.live().await.is_empty());
    assert_eq!(rig.sim.live_instances(), 1, "only the other cluster's instance is left");
}

#[tokio::test]
async fn an_idle_runner_is_cordoned_then_released_and_the_pool_reaches_zero() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    let now = now_ms();
    leader
        .cycle(&demand(vec![job("a", 2, "spot")]), &Seen::default(), now)
        .await
        .unwrap();
    let instance = rig.live().await[0].instance_id.clone();
    let on = HashMap::from([(instance.clone(), "r-1".to_string())]);
    let busy = Seen {
        runner_on: on.clone(),
        busy: ["r-1".to_string()].into(),
        ..Seen::default()
    };
    let idle = Seen {
        runner_on: on,
        ..Seen::default()
    };
    let cycle = leader.cycle(&demand(vec![]), &busy, now + 1_000).await.unwrap();
    assert_eq!(cycle.released.registered, 1);
    // Idle from +2 s; the idle timeout is 60 s.
    leader.cycle(&demand(vec![]), &idle, now + 2_000).await.unwrap();
    let cycle = leader.cycle(&demand(vec![]), &idle, now + 62_000).await.unwrap();
    assert_eq!(cycle.released.cordoned, 1);
    assert_eq!(rig.live().await[0].state, instance_state::CORDONED);
    // A job placed on it in the meantime takes the cordon back.
    let cycle = leader.cycle(&demand(vec![]), &busy, now + 63_000).await.unwrap();
    assert_eq!(cycle.released.uncordoned, 1);
    leader.cycle(&demand(vec![]), &idle, now + 64_000).await.unwrap();
    leader.cycle(&demand(vec![]), &idle, now + 124_000).await.unwrap();
    assert_eq!(rig.live().await[0].state, instance_state::CORDONED);
    let cycle = leader.cycle(&demand(vec![]), &idle, now + 127_001).await.unwrap();
    assert_eq!(cycle.released.terminated, 1);
    assert!(rig.live().await.is_empty());
    assert_eq!(rig.sim.live_instances(), 0, "the pool is back to zero");
    assert_eq!(cycle.statuses[0].live_instances, 0);
}

#[tokio::test]
async fn an_interrupted_instance_is_released_once_its_jobs_are_handed_back() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    let now = now_ms();
    leader
        .cycle(&demand(vec![job("a", 2, "spot")]), &Seen::default(), now)
        .await
        .unwrap();
    let instance = rig.live().await[0].instance_id.clone();
    let on = HashMap::from([(instance.clone(), "r-1".to_string())]);
    let busy = Seen {
        runner_on: on.clone(),
        busy: ["r-1".to_string()].into(),
        interrupted: [instance.clone()].into(),
    };
    leader.cycle(&demand(vec![]), &busy, now + 1_000).await.unwrap();
    let cycle = leader.cycle(&demand(vec![]), &busy, now + 2_000).await.unwrap();
    assert_eq!(cycle.released.interrupted, 0, "not while a job is on it");
    let handed_back = Seen {
        runner_on: on,
        interrupted: [instance].into(),
        ..Seen::default()
    };
    // Well within the idle timeout (60 s): the notice does not wait for it.
    let cycle = leader.cycle(&demand(vec![]), &handed_back, now + 3_000).await.unwrap();
    assert_eq!((cycle.released.interrupted, cycle.released.terminated), (1, 1));
    assert_eq!(rig.sim.live_instances(), 0);
    let gone = rig
        .store
        .instances(CLUSTER, &[instance_state::TERMINATED])
        .await
        .unwrap();
    assert_eq!(gone[0].reason, "spot interruption");
}

#[tokio::test]
async fn a_status_lists_the_launches_on_their_way_and_none_of_the_past_ones() {
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    // A long-lived cluster's history: launched intents whose instances are long gone.
    let now = now_ms();
    for n in 0..50 {
        let at = now - 3_600_000 + n * 1000;
        rig.store
            .insert_intent(kiln_core::store::IntentRecord {
                id: IntentId::new().to_string(),
                cluster: CLUSTER.into(),
                pool: "cpu".into(),
                capacity: "spot".into(),
                count: 1,
                min_count: 1,
                single_zone: false,
                request: "{}".into(),
                demand: serde_json::to_string(&[format!("old-{n}")]).unwrap(),
                state: intent_state::LAUNCHED.into(),
                version: 3,
                created_at_ms: at,
                called_at_ms: at,
                settled_at_ms: at,
                failures: "[]".into(),
                attempts: 1,
            })
            .await
            .unwrap();
    }
    let wanted = demand(vec![job("s", 2, "spot"), job("o", 2, "on-demand")]);
    let cycle = leader.cycle(&wanted, &Seen::default(), now).await.unwrap();
    assert_eq!((cycle.calls, cycle.launched), (2, 2));
    let again = leader.cycle(&wanted, &Seen::default(), now + 1_000).await.unwrap();
    let launching = &again.statuses[0].launching;
    let jobs: Vec<&[String]> = launching.iter().map(|l| l.jobs.as_slice()).collect();
    assert_eq!(jobs.len(), 2, "{launching:?}");
    assert!(jobs.contains(&&["s".to_string()][..]) && jobs.contains(&&["o".to_string()][..]));
    assert!(launching.windows(2).all(|w| w[0].intent_id != w[1].intent_id));
    // The spot machine's runner registers: only the on-demand launch is still on its way.
    let spot = rig.live().await.into_iter().find(|i| i.capacity == "spot").unwrap();
    let seen = Seen {
        runner_on: HashMap::from([(spot.instance_id.clone(), "r-1".to_string())]),
        busy: ["r-1".to_string()].into(),
        ..Seen::default()
    };
    let after = leader
        .cycle(&demand(vec![job("o", 2, "on-demand")]), &seen, now + 2_000)
        .await
        .unwrap();
    let launching = &after.statuses[0].launching;
    assert_eq!(launching.len(), 1);
    assert_eq!(launching[0].jobs, ["o"]);
    assert_eq!(launching[0].capacity, "on-demand");
}

#[tokio::test]
async fn a_job_asking_for_disk_gets_a_machine_whose_root_volume_is_sized_for_it_once() {
    let rig = Rig::new().await;
    // The sim cloud stands in for EC2 here (no runner registers in this test); a sim pool's
    // config may not size volumes, as the sim fleet's runners report no disk.
    let mut sized = pool();
    sized.disk.max_job_gib = 500;
    let mut leader = rig.leader_of(sized);
    let mut disk_job = job("disk", 2, "spot");
    disk_job.resources.disk_bytes = 180 << 30;
    let wanted = demand(vec![disk_job, job("plain", 2, "spot")]);
    let first = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert!(first.launched >= 1, "{first:?}");
    // What the pool offers a job's disk is in its status, for the scheduler's "can any pool
    // ever hold it".
    assert_eq!(first.statuses[0].largest.disk_bytes, 500 << 30);
    let intents = rig.store.intents(CLUSTER, &[intent_state::LAUNCHED]).await.unwrap();
    let volumes: Vec<Option<kiln_cloud::RootVolume>> = intents
        .iter()
        .map(|i| serde_json::from_str::<LaunchIntent>(&i.request).unwrap().root_volume)
        .collect();
    // 180 GiB of jobs: the template's 100 GiB and 200 for the job (the runner offers 90%).
    let expected = kiln_cloud::RootVolume {
        device: "/dev/xvda".into(),
        size_gib: 300,
    };
    assert!(volumes.contains(&Some(expected)), "{volumes:?}");
    assert!(
        volumes.iter().all(|v| v.as_ref().is_none_or(|v| v.size_gib == 300)),
        "only the disk job's machine is sized: {volumes:?}"
    );
    // Again: the machine on its way holds the disk job (its volume counted); nothing more.
    let second = leader.cycle(&wanted, &Seen::default(), now_ms()).await.unwrap();
    assert_eq!((second.calls, second.launched), (0, 0), "{second:?}");

    // The same job on a pool that sizes no volumes is not its demand at all.
    let rig = Rig::new().await;
    let mut leader = rig.leader();
    let mut disk_job = job("disk", 2, "spot");
    disk_job.resources.disk_bytes = 1 << 30;
    let cycle = leader
        .cycle(&demand(vec![disk_job]), &Seen::default(), now_ms())
        .await
        .unwrap();
    assert_eq!((cycle.calls, cycle.launched), (0, 0));
    assert_eq!(cycle.statuses[0].largest.disk_bytes, 0);
}
