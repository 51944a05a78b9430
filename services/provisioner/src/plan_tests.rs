use kiln_cloud::PriceSource;

use super::*;

const GIB: i64 = 1 << 30;

fn offering(instance_type: &str, zone: &str, capacity: CapacityType, cpus: i64, price: f64) -> Offering {
    Offering {
        key: OfferingKey {
            instance_type: instance_type.into(),
            zone: zone.into(),
            capacity,
        },
        shape: Shape {
            cpu_millis: cpus * 1000,
            memory_bytes: cpus * 2 * GIB,
            gpus: 0,
            gpu_model: None,
            arch: "x86_64".into(),
        },
        price_per_hour: price,
        price_source: PriceSource::Configured,
        subnet: None,
    }
}

fn job(id: &str, cpus: i64, market: &str) -> DemandJob {
    DemandJob {
        job_id: id.into(),
        pool: String::new(),
        resources: Instance {
            cpu_millis: cpus * 1000,
            memory_bytes: cpus * GIB,
            gpus: 0,
            disk_bytes: 0,
        },
        nodes: 1,
        market: market.into(),
        chosen_market: String::new(),
        priority: 0,
        submitted_at_ms: 0,
    }
}

/// c5 shapes in two zones, spot at a third of on-demand.
fn catalogue() -> Vec<Offering> {
    let mut offerings = Vec::new();
    for zone in ["z-a", "z-b"] {
        for (name, cpus, price) in [("c5.large", 2, 0.085), ("c5.xlarge", 4, 0.17), ("c5.2xlarge", 8, 0.34)] {
            offerings.push(offering(name, zone, CapacityType::OnDemand, cpus, price));
            offerings.push(offering(name, zone, CapacityType::Spot, cpus, price / 3.0));
        }
    }
    offerings
}

const BOTH: [CapacityType; 2] = [CapacityType::Spot, CapacityType::OnDemand];

fn input<'a>(offerings: &'a [Offering], demand: &'a [DemandJob]) -> PoolInput<'a> {
    PoolInput {
        pool: "cpu",
        offerings,
        unavailable_reasons: Vec::new(),
        demand: demand.iter().collect(),
        coming: Vec::new(),
        live_instances: 0,
        max_instances: 100,
        capacity_types: &BOTH,
        job_disk_bytes: 0,
    }
}

fn launched_jobs(plan: &PoolPlan) -> Vec<String> {
    let mut jobs: Vec<String> = plan.launch.iter().flat_map(|m| m.jobs.clone()).collect();
    jobs.sort();
    jobs
}

#[test]
fn forty_mixed_jobs_are_packed_no_dearer_than_a_tenth_over_the_bound() {
    let offerings = catalogue();
    let mut demand = Vec::new();
    for n in 0..40 {
        let cpus = [1, 2, 4, 3][n % 4];
        demand.push(job(&format!("j{n:02}"), cpus, "auto"));
    }
    let plan = plan(&input(&offerings, &demand));
    let mut expected: Vec<String> = demand.iter().map(|j| j.job_id.clone()).collect();
    expected.sort();
    assert_eq!(launched_jobs(&plan), expected, "every job is on exactly one machine");
    assert!(plan.held_back.is_empty() && plan.covered.is_empty());
    assert!(
        plan.launch.iter().all(|m| m.capacity == CapacityType::Spot),
        "auto goes to spot"
    );
    let cost: f64 = plan
        .launch
        .iter()
        .map(|m| m.count as f64 * m.candidates[0].price_per_hour)
        .sum();
    // Lower bound: every CPU at the cheapest spot price per CPU.
    let cpus: i64 = demand.iter().map(|j| j.resources.cpu_millis / 1000).sum();
    let bound = cpus as f64 * (0.085 / 3.0 / 2.0);
    assert!(cost <= bound * 1.1, "cost {cost} vs bound {bound}");
    let machines: u32 = plan.launch.iter().map(|m| m.count).sum();
    assert_eq!(machines, 13, "100 CPUs on 8-CPU machines: 13 (12.5 rounded up)");
}

#[test]
fn candidates_are_cheapest_first_and_of_one_capacity_type() {
    let offerings = catalogue();
    let demand = [job("j", 3, "on-demand")];
    let plan = plan(&input(&offerings, &demand));
    assert_eq!(plan.launch.len(), 1);
    let machines = &plan.launch[0];
    assert_eq!((machines.capacity, machines.count), (CapacityType::OnDemand, 1));
    let names: Vec<String> = machines.candidates.iter().map(|c| c.key.to_string()).collect();
    assert_eq!(
        names,
        [
            "on-demand c5.xlarge in z-a",
            "on-demand c5.xlarge in z-b",
            "on-demand c5.2xlarge in z-a",
            "on-demand c5.2xlarge in z-b"
        ]
    );
}

#[test]
fn machines_on_their_way_hold_jobs_and_nothing_is_launched_again() {
    let offerings = catalogue();
    let demand = [job("a", 2, "auto"), job("b", 2, "auto"), job("c", 2, "on-demand")];
    let mut pool = input(&offerings, &demand);
    pool.coming = vec![Coming {
        capacity: CapacityType::Spot,
        room: Room::of_shape(&offerings[4].shape, 0),
    }];
    let plan = plan(&pool);
    assert_eq!(
        plan.covered,
        ["a", "b"],
        "the coming 8-CPU spot machine holds both auto jobs"
    );
    assert_eq!(
        launched_jobs(&plan),
        ["c"],
        "an on-demand job does not ride a spot machine"
    );
}

#[test]
fn auto_falls_back_to_on_demand_and_spot_only_waits_with_the_reason() {
    let offerings: Vec<Offering> = catalogue()
        .into_iter()
        .filter(|o| o.key.capacity == CapacityType::OnDemand)
        .collect();
    let demand = [job("auto", 1, "auto"), job("spot", 1, "spot")];
    let mut pool = input(&offerings, &demand);
    pool.unavailable_reasons = vec!["spot c5.large in z-a: no capacity".into()];
    let plan = plan(&pool);
    assert_eq!(launched_jobs(&plan), ["auto"]);
    assert_eq!(plan.launch[0].capacity, CapacityType::OnDemand);
    assert_eq!(
        plan.held_back,
        [(
            "spot".to_string(),
            "pool cpu: no available spot offering holds it (spot c5.large in z-a: no capacity)".to_string()
        )]
    );
}

#[test]
fn max_instances_caps_new_machines_and_says_so() {
    let offerings = catalogue();
    let demand: Vec<DemandJob> = (0..4).map(|n| job(&format!("j{n}"), 8, "auto")).collect();
    let mut pool = input(&offerings, &demand);
    pool.live_instances = 2;
    pool.max_instances = 3;
    let plan = plan(&pool);
    assert_eq!(plan.launch.iter().map(|m| m.count).sum::<u32>(), 1);
    assert_eq!(plan.held_back.len(), 3);
    assert!(
        plan.held_back
            .iter()
            .all(|(_, why)| why == "pool cpu at max-instances (3)")
    );
}

#[test]
fn a_machine_dearer_than_its_jobs_apart_is_split() {
    // A big machine whose price per CPU is far above the small one's.
    let offerings = vec![
        offering("big", "z-a", CapacityType::OnDemand, 8, 1.0),
        offering("small", "z-a", CapacityType::OnDemand, 1, 0.05),
    ];
    let demand = [job("a", 1, "on-demand"), job("b", 1, "on-demand")];
    let plan = plan(&input(&offerings, &demand));
    assert_eq!(plan.launch.len(), 1);
    assert_eq!(plan.launch[0].count, 2);
    assert_eq!(plan.launch[0].candidates[0].key.instance_type, "small");
}

#[test]
fn a_job_no_offering_holds_is_held_back() {
    let offerings = catalogue();
    let demand = [job("huge", 64, "auto")];
    let plan = plan(&input(&offerings, &demand));
    assert!(plan.launch.is_empty());
    assert_eq!(plan.held_back[0].1, "pool cpu: no available offering holds it");
}

fn gang(id: &str, cpus: i64, nodes: u32) -> DemandJob {
    DemandJob {
        nodes,
        ..job(id, cpus, "auto")
    }
}

#[test]
fn a_gang_is_one_group_of_machines_apart_from_the_packing() {
    let offerings = catalogue();
    // Three 3-CPU nodes and two 1-CPU jobs: packed together they would share machines; a
    // gang gets a machine per node, of its own, in one group.
    let demand = [gang("g", 3, 3), job("a", 1, "auto"), job("b", 1, "auto")];
    let plan = plan(&input(&offerings, &demand));
    let gangs: Vec<&Machines> = plan.launch.iter().filter(|m| m.gang).collect();
    assert_eq!(gangs.len(), 1, "{plan:?}");
    assert_eq!((gangs[0].count, gangs[0].jobs.clone()), (3, vec!["g".to_string()]));
    assert_eq!(gangs[0].capacity, CapacityType::Spot);
    // Every candidate holds one node (4 CPUs and up), cheapest first, in both zones: the cloud
    // picks the zone that holds all three.
    assert!(gangs[0].candidates.iter().all(|c| c.shape.cpu_millis >= 3000));
    assert_eq!(gangs[0].candidates[0].key.instance_type, "c5.xlarge");
    assert!(gangs[0].candidates.iter().any(|c| c.key.zone == "z-b"));
    let others: Vec<&Machines> = plan.launch.iter().filter(|m| !m.gang).collect();
    assert!(others.iter().all(|m| !m.jobs.contains(&"g".to_string())));
    assert_eq!(launched_jobs(&plan), ["a", "b", "g"]);
}

#[test]
fn machines_on_their_way_hold_a_gang_node_each_and_only_the_rest_launch() {
    let offerings = catalogue();
    let demand = [gang("g", 2, 4)];
    let mut input = input(&offerings, &demand);
    // Two machines on their way, one with room for two nodes: still one node each.
    input.coming = vec![
        Coming {
            capacity: CapacityType::Spot,
            room: Room::of_shape(&offerings[2].shape, 0),
        },
        Coming {
            capacity: CapacityType::Spot,
            room: Room::of_shape(&offerings[0].shape, 0),
        },
    ];
    let plan = plan(&input);
    assert_eq!(plan.launch.len(), 1, "{plan:?}");
    assert_eq!((plan.launch[0].count, plan.launch[0].gang), (2, true));
    // All four on their way: covered, nothing launched.
    input.coming.extend(input.coming.clone());
    let plan = super::plan(&input);
    assert!(plan.launch.is_empty(), "{plan:?}");
    assert_eq!(plan.covered, ["g"]);
}

#[test]
fn max_instances_takes_a_gang_whole_or_holds_it_back() {
    let offerings = catalogue();
    let demand = [gang("g", 2, 3)];
    let mut input = input(&offerings, &demand);
    input.live_instances = 98;
    let plan = plan(&input);
    assert!(plan.launch.is_empty(), "{plan:?}");
    assert_eq!(plan.held_back.len(), 1);
    assert!(
        plan.held_back[0]
            .1
            .contains("max-instances (100): its gang needs 3 machines at once"),
        "{:?}",
        plan.held_back
    );
    input.live_instances = 97;
    assert_eq!(super::plan(&input).launch[0].count, 3);
}

#[test]
fn a_machine_grows_to_a_larger_type_only_while_its_room_is_no_dearer() {
    // The sim's shapes: c.large 2 CPUs at 0.030, c.xlarge 4 at 0.060, m.2xlarge 8 (with four
    // times the memory) at 0.130. Eight 1-CPU jobs cost 0.120 on two c.xlarge; one m.2xlarge
    // would hold them all for 0.130, paying for memory nobody asked for.
    let shape = |name: &str, cpus: i64, gib: i64, price: f64| Offering {
        shape: Shape {
            cpu_millis: cpus * 1000,
            memory_bytes: gib * GIB,
            gpus: 0,
            gpu_model: None,
            arch: "x86_64".into(),
        },
        ..offering(name, "z-a", CapacityType::Spot, cpus, price)
    };
    let offerings = vec![
        shape("c.large", 2, 4, 0.030),
        shape("c.xlarge", 4, 8, 0.060),
        shape("m.2xlarge", 8, 32, 0.130),
    ];
    let demand: Vec<DemandJob> = (0..8).map(|n| job(&format!("j{n}"), 1, "spot")).collect();
    let plan = plan(&input(&offerings, &demand));
    let bought: Vec<(String, u32)> = plan
        .launch
        .iter()
        .map(|m| (m.candidates[0].key.instance_type.clone(), m.count))
        .collect();
    assert_eq!(bought, [("c.xlarge".to_string(), 2)], "{plan:?}");
}

#[test]
fn jobs_asking_for_disk_get_machines_whose_volumes_hold_them_and_no_more() {
    let offerings = catalogue();
    let disk = |id: &str, cpus: i64, disk_gib: i64| {
        let mut job = job(id, cpus, "spot");
        job.resources.disk_bytes = disk_gib * GIB;
        job
    };
    // Four 1-CPU jobs of 300 GiB each: one 8-CPU machine holds the CPUs, but a machine's
    // jobs may have 500 GiB at most, so they are split one per machine; two small jobs
    // without disk share a machine of their own.
    let demand = [
        disk("d1", 1, 300),
        disk("d2", 1, 300),
        disk("d3", 1, 150),
        disk("d4", 1, 150),
        job("p1", 1, "spot"),
        job("p2", 1, "spot"),
    ];
    let mut pool = input(&offerings, &demand);
    pool.job_disk_bytes = 500 * GIB;
    let split = plan(&pool);
    assert!(split.held_back.is_empty(), "{:?}", split.held_back);
    for machines in &split.launch {
        assert!(machines.disk_bytes <= 500 * GIB, "{machines:?}");
        let asked: i64 = machines
            .jobs
            .iter()
            .map(|id| demand.iter().find(|j| &j.job_id == id).unwrap().resources.disk_bytes)
            .sum();
        assert!(
            machines.disk_bytes * i64::from(machines.count) >= asked,
            "volumes hold their jobs' disks: {machines:?}"
        );
    }
    let sized: i64 = split.launch.iter().map(|m| m.disk_bytes * i64::from(m.count)).sum();
    assert_eq!(
        sized,
        900 * GIB,
        "the jobs' 900 GiB, no machine sized for a disk it does not hold"
    );
    let machines: u32 = split.launch.iter().map(|m| m.count).sum();
    assert!(
        machines >= 2,
        "300 + 300 GiB on one machine would pass its 500: {split:?}"
    );

    // A job asking for more than a machine of the pool may have is held back with the reason;
    // so is any job asking for disk on a pool that sizes no volumes.
    let too_big = [disk("big", 1, 600)];
    let mut pool = input(&offerings, &too_big);
    pool.job_disk_bytes = 500 * GIB;
    let held = plan(&pool);
    assert!(held.launch.is_empty(), "{held:?}");
    assert_eq!(held.held_back.len(), 1);
    assert!(
        held.held_back[0].1.contains("no available spot offering holds it"),
        "{held:?}"
    );
    let any = [disk("any", 1, 1)];
    let held = plan(&input(&offerings, &any));
    assert!(held.launch.is_empty() && held.held_back.len() == 1, "{held:?}");
}
